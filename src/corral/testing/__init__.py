"""Test support shipped with corral: a fake clock, shape-named factories, an in-process server, a
scripted client for worker tests."""
