from django.contrib import admin

from .models import Order


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ("id", "batch", "email", "sku", "total_cents", "status", "charge_attempts",
                    "updated_at")
    list_filter = ("status", "batch")
