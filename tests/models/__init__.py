"""Models defined by the test suite, importable by the training workers as ``models.<module>``
(tests/*/test_families.py puts this folder's parent on PYTHONPATH)."""
