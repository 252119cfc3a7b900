"""Routes without device authentication: the server's public key and the Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from server.api.schemas import ServerKeyBody
from server.api.state import server_state

router = APIRouter()


@router.get("/api/v1/server-key", response_model=ServerKeyBody, tags=["server"],
            summary="the public key every schedule is signed with (what agents pin)")
def server_key(request: Request) -> ServerKeyBody:
    key = server_state(request).key
    return ServerKeyBody(public_key=key.public_pem, key_id=key.key_id)


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request) -> Response:
    return Response(server_state(request).metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
