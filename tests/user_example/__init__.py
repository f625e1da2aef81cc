"""A user's own example, outside dropmask: the fixture CI trains from the installed wheel."""
