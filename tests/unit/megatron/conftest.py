"""One torch thread for the tests of this package (tests/support/torch_threads.py)."""

from tests.support.torch_threads import one_torch_thread  # noqa: F401  (autouse)
