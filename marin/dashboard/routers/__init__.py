"""One router per resource; each serves its JSON API under /api and the HTML page that uses it."""
