"""Thin re-exports kept for importers outside kernels/ (the family is ``kernels/attention``)."""
