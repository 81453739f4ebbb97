from django.contrib import admin
from django.urls import include, path

from django_xjobs import views

urlpatterns = [
    path("admin/", admin.site.urls),
    # The operations console's own site (docs/console.md): test_console_site.py walks it.
    path("_x/", include("django_xjobs.urls")),
    # What a project mounts for Prometheus (docs/observability.md): test_metrics.py scrapes it.
    path("metrics", views.metrics),
]
