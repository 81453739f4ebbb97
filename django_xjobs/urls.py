"""The operations console's URLs: ``path("_x/", include("django_xjobs.urls"))`` serves it at
``/_x/`` (docs/console.md). The console is an admin site of its own (:mod:`console.sites`),
under the URL namespace ``xjobs_console``; ``reverse("xjobs_console:index")`` is the
dashboard."""

from django.urls import path

from .console.sites import site

urlpatterns = [path("", site.urls)]
