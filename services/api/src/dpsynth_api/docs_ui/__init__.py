"""``/docs`` (Swagger UI) and ``/redoc`` (ReDoc), served with every file they load from the
installed packages: no CDN, so they work in a network without internet (issue 15, item 7)."""
