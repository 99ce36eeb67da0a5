from django.http import HttpRequest, JsonResponse

from reports.tasks import build_report


def request_report(request: HttpRequest, rows: int) -> JsonResponse:
    """Queue a report for the tenant of this request (set by TenantMiddleware)."""
    result = build_report.delay(rows)
    return JsonResponse({"task_id": result.id}, status=202)
