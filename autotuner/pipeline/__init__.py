"""The stages joined: a tune runs the search, confirms and promotes."""
