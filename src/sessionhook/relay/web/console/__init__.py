"""The operator console: server-rendered pages under ``/console`` on the daemon's listener.

Its modules import one way, from the route list down to pure helpers:

* :mod:`.routes`: the route list and the provider the web app includes;
* :mod:`.pages` (GET views), :mod:`.actions` (POSTs: replay, enable/disable, test event),
  :mod:`.live` (the Server-Sent Events feed of new events), which never import each other;
* :mod:`.common`: :class:`~.common.ConsoleDeps`, the Jinja2 environment and page rendering,
  the flash cookie, the error pages;
* :mod:`.text` (filters; numbers and times read from URLs and forms) and :mod:`.chart` (the
  overview's chart), pure.

Everything shown that came from upstream or a consumer (titles, prompts, diffs, response
bodies, error texts) is hostile input: the templates (``templates/console/``) are Jinja2 with
autoescaping on, the script builds live rows with ``textContent``, and every page carries a
strict Content-Security-Policy (scripts and styles from this server only, no inline
script). All assets ship in ``static/``; nothing is loaded from another host.
"""
