from django.contrib import admin
from django.urls import path

from django_xjobs import views

urlpatterns = [
    path("admin/", admin.site.urls),
    # What a project mounts for Prometheus (docs/observability.md): test_metrics.py scrapes it.
    path("metrics", views.metrics),
]
