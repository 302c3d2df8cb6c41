"""Checks judge a golden against an in-tree record; the registry names every one."""
