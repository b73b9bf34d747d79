"""POST /checkout/ is the example's one URL."""

from django.urls import path

from shop import views

urlpatterns = [path("checkout/", views.checkout)]
