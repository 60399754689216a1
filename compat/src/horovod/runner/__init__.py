"""horovod.runner: `horovodrun` (launch.py), Horovod's launcher flags over hvdliterun."""
