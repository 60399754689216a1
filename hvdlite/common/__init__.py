"""Framework-neutral Python shared by every hvdlite adapter (NumPy, PyTorch, TensorFlow)."""
