"""The checkout view: the order and its job commit together, or neither does."""

from django.db import transaction
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from runledger_sync.contrib import django as runledger
from shop.models import Order


@csrf_exempt   # a JSON endpoint the Django guide calls with curl; keep CSRF on your form views
@require_POST
def checkout(request):
    with transaction.atomic():
        order = Order.objects.create(item=request.POST["item"], quantity=int(request.POST.get("quantity", 1)))
        job = runledger.enqueue("orders.confirm", {"order_id": order.pk})  # only if the block commits
    return JsonResponse({"order_id": order.pk, "job_id": str(job.id)}, status=201)
