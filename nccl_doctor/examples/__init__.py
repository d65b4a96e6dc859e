"""Small runnable jobs used by `make demo` and the tests."""
