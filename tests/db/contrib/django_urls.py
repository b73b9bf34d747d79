"""The URLconf of the Django dashboard tests: the one line a project adds."""

from django.urls import include, path

urlpatterns = [path("ops/", include("runledger_sync.contrib.django.urls"))]
