"""README.md stays honest: its API tour runs, and its settings table is the generated one."""

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()


def test_api_tour_runs_on_two_ranks(tmp_path):
    tour = re.search(r"```python\n(.*?)```", README, re.S).group(1)
    script = tmp_path / "tour.py"
    script.write_text(tour + "\nimport os; print('tour done', os.environ['HVDLITE_RANK'])\n")
    res = subprocess.run(
        [sys.executable, "-m", "hvdlite.runner.launch", "-np", "2", sys.executable, str(script)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "[0]<stdout>:tour done 0" in res.stdout and "[1]<stdout>:tour done 1" in res.stdout
    assert "Mismatched shapes" in res.stdout  # the tour's deliberate error was caught


def test_settings_table_is_the_generated_one():
    sys.path.insert(0, str(REPO / "hvdlite" / "common"))
    try:
        import settings
    finally:
        sys.path.pop(0)
    assert settings.markdown_table() in README, (
        "regenerate the README table: python hvdlite/common/settings.py --markdown"
    )
