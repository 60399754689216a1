"""The torch side of hvd.Mesh jobs (the mesh itself, framework-neutral, is hvdlite/parallel/mesh.py):
MeshState, the elastic state that re-forms a mesh job on its survivors by shrinking dp
(state.py; the plan is hvdlite/parallel/reform.py). docs/elastic.md, "Mesh jobs", is the user
page."""

from hvdlite.torch.parallel.mesh.state import MeshState

__all__ = ["MeshState"]
