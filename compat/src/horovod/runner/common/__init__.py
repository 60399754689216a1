"""Horovod's horovod.runner.common package: the helpers Horovod's own tests import (util.env)."""
