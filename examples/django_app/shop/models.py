"""The shop's one model: an order, confirmed by the orders.confirm job."""

from django.db import models


class Order(models.Model):
    item = models.CharField(max_length=200)
    quantity = models.PositiveIntegerField(default=1)
    status = models.CharField(max_length=20, default="new")   # "confirmed" once its job has run
    created_at = models.DateTimeField(auto_now_add=True)
