from django.db import models


class Order(models.Model):
    STATUSES = [("new", "new"), ("charged", "charged"), ("shipped", "shipped"),
                ("rejected", "rejected")]

    batch = models.CharField(max_length=40, db_index=True)
    email = models.EmailField()
    sku = models.CharField(max_length=40)
    total_cents = models.IntegerField()
    status = models.CharField(max_length=20, choices=STATUSES, default="new")
    charge_attempts = models.IntegerField(default=0)
    # What happened to the order, in order (the durable fulfil_order job appends to it).
    timeline = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"order {self.pk} ({self.status})"
