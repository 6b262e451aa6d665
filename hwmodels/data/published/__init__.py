"""Published measurements (with citations) the models are checked against; a package so setuptools ships its *.yaml."""
