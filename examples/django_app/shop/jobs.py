"""The project's job handlers, named by RUNLEDGER["REGISTRY"] = "shop.jobs:registry"."""

import runledger_sync as rl
from shop.models import Order

registry = rl.JobRegistry()


@registry.job("orders.confirm", max_attempts=5, timeout_seconds=60)
def confirm_order(ctx: rl.JobContext, payload: dict) -> rl.JobCompletion:
    # Charge the card, e-mail the customer... Delivery is at least once: confirm only a new order.
    confirmed = Order.objects.filter(pk=payload["order_id"], status="new").update(status="confirmed")
    return rl.JobCompletion.success().with_output({"order_id": payload["order_id"], "confirmed": bool(confirmed)})
