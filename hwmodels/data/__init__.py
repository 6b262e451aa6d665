"""Data files of hwmodels (a package so that setuptools ships its *.yaml)."""
