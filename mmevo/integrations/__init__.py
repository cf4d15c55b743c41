"""Explicit fixes of upstream libraries, one subpackage per library.

Nothing here is turned on by importing it: each fix has an ``install()`` (or
a context manager) that checks the upstream version it was written for.
"""
