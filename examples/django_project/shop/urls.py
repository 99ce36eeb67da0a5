from django.urls import path
from reports import views

urlpatterns = [path("reports/<int:rows>", views.request_report)]
