"""The console's pages that are not a model's list or detail page.

* :mod:`.dashboard`: the dashboard (the console's index) and a queue's page, with their charts;
* :mod:`.health`: the health panel;
* :mod:`.pauses`: pausing and resuming a queue or a key;
* :mod:`.page`: the frame they share.

Each view is a function of the ``JobAdmin`` that serves it, whose methods of the same name
``JobAdmin.get_urls`` mounts (the way Django's ``AdminSite.autocomplete_view`` takes the
model admin it serves): its site, its permissions, its URLs.
"""
