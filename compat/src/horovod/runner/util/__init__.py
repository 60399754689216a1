"""Horovod's horovod.runner.util package: the helpers user code and Horovod's own test utilities
import (threads)."""
