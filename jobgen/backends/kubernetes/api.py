"""The Kubernetes API client jobgen uses: one kubeconfig context over the official
``kubernetes`` client's ApiClient (auth, TLS, exec plugins), with plain-dict requests so the
generated models never drop or coerce a field jobgen sent. Imported only to submit, read status
or logs, or cancel; never on the render path."""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path
from typing import Any

from jobgen.errors import ConfigError, SubmitError

#: Environment variables that override the profile's context / namespace (flags override both).
ENV_CONTEXT = "JOBGEN_K8S_CONTEXT"
ENV_NAMESPACE = "JOBGEN_K8S_NAMESPACE"

#: First server minor version with the ``fieldValidation`` query parameter on by default
#: (beta in 1.25, GA in 1.27); older servers ignore it and prune unknown fields silently.
FIELD_VALIDATION_SINCE = (1, 25)


class ApiError(SubmitError):
    """The API server answered with an error status.

    Attributes:
        status: the HTTP status (404, 409, 422, ...).
        reason: the Status object's ``reason`` (NotFound, AlreadyExists, Invalid, ...).
    """

    def __init__(self, message: str, *, status: int, reason: str = "", hint: str | None = None):
        super().__init__(message, hint=hint)
        self.status = status
        self.reason = reason


class Cluster:
    """A connection to one kubeconfig context, over the official ``kubernetes`` client's
    ApiClient (auth, TLS, exec plugins). Requests go through :meth:`request` with plain dicts,
    so the generated models never drop or coerce a field jobgen sent."""

    def __init__(self, api: Any, context: str):
        self.api = api
        self.context = context
        self._version: tuple[int, int] | None = None

    def request(self, method: str, path: str, *, query: list[tuple[str, str]] | None = None, body: Any = None,
                timeout: float | tuple[float, float] = 30.0, stream: bool = False) -> Any:
        """One API call; returns the decoded JSON body (or the raw urllib3 response with ``stream``).

        Raises:
            ApiError: a non-2xx answer (status, the server's message).
            SubmitError: the server cannot be reached.
        """
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        try:
            serialized = self.api.param_serialize(method=method, resource_path=path, query_params=query or [],
                                                  header_params=headers, body=body, auth_settings=["BearerToken"])
            response = self.api.call_api(*serialized, _request_timeout=timeout)
        except Exception as exc:  # urllib3 connection errors, TLS, exec-plugin failures
            if isinstance(exc, ApiError):
                raise
            raise SubmitError(f"cannot reach the Kubernetes API server of context {self.context!r}: {exc}",
                              hint=f"check `kubectl --context {shlex.quote(self.context)} get --raw /readyz`, the kubeconfig "
                              "and the network") from None
        if 200 <= response.status < 300:
            if stream:
                return response.response
            return decode_body(response.read(), f"{method} {path}")
        data = response.read() or b""
        message, reason = data.decode("utf-8", "replace").strip(), ""
        try:
            status_doc = json.loads(data)
            message, reason = status_doc.get("message", message), status_doc.get("reason", "")
        except ValueError:
            pass
        raise ApiError(f"{method} {path}: {response.status} {reason or response.reason}: {message}", status=response.status, reason=reason)

    @property
    def server_version(self) -> tuple[int, int] | None:
        """``(major, minor)`` from ``/version`` (None when the server does not say). Not the
        client's ``VersionApi``: it asks ``/version/``, which newer servers answer with 404."""
        if self._version is None:
            try:
                doc = self.request("GET", "/version")
                self._version = (int(doc["major"]), int(re.sub(r"\D.*", "", str(doc["minor"]))))
            except (ApiError, KeyError, ValueError):
                return None
        return self._version

    @property
    def field_validation(self) -> bool:
        """Whether the server rejects unknown fields with ``fieldValidation=Strict``."""
        version = self.server_version
        return version is not None and version >= FIELD_VALIDATION_SINCE


def decode_body(data: bytes, what: str) -> Any:
    """A 2xx answer's body as JSON (``{}`` when empty); bytes that are not UTF-8 are kept as lone
    surrogates, which :func:`jobgen.errors.printable` shows escaped.

    Raises:
        SubmitError: the body is not JSON (a proxy's HTML page, a truncated answer); ``what``
            names the request.
    """
    if not data:
        return {}
    try:
        return json.loads(data.decode("utf-8", "surrogateescape"))
    except ValueError:
        shown = data[:120].decode("utf-8", "backslashreplace")
        raise SubmitError(f"{what}: the API server's answer is not JSON: {shown!r}",
                          hint="check that the context's server is a Kubernetes API server (kubectl get --raw /version)") from None


#: Where jobgen takes the kubeconfig from (status, logs and cancel use the one submit used).
KUBECONFIG_HINT = ("point $KUBECONFIG or the profile's kubernetes.kubeconfig at your cluster's kubeconfig "
                   "(jobgen submit --kubeconfig FILE for one submission)")


def kubeconfig_path(kubeconfig: str | None) -> str:
    """The kubeconfig file(s) to read: the given path, else ``$KUBECONFIG`` (a ``:``-separated
    list is merged, as kubectl does), else ``~/.kube/config``."""
    return kubeconfig or os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")


def connect(context: str | None = None, kubeconfig: str | None = None) -> Cluster:
    """Open a :class:`Cluster` for ``context`` (None: the kubeconfig's current context).

    Raises:
        ConfigError: the ``kubernetes`` client is not installed, the kubeconfig does not exist
            (none of ``$KUBECONFIG``'s files), is not a valid kubeconfig (each said as such), or
            has no such context (the known ones are listed).
    """
    import yaml

    try:
        from kubernetes import config as kube_config
        from kubernetes.config.config_exception import ConfigException
    except ImportError:
        raise ConfigError("submitting to Kubernetes needs the official client", hint="pip install 'jobgen[k8s]'") from None
    path = kubeconfig_path(kubeconfig)
    origin = "" if kubeconfig else " ($KUBECONFIG)" if os.environ.get("KUBECONFIG") else " (the default)"
    files = [Path(p).expanduser() for p in path.split(os.pathsep) if p]
    if not any(f.exists() for f in files):
        raise ConfigError(f"kubeconfig {path}{origin} does not exist", hint=KUBECONFIG_HINT)
    try:
        contexts, active = kube_config.list_kube_config_contexts(config_file=path)
    except (ConfigException, OSError, ValueError, TypeError, KeyError, AttributeError, yaml.YAMLError) as exc:
        # the client's loader fails with TypeError/AttributeError on YAML that is not a mapping of lists
        problem = " ".join(str(exc).split())
        raise ConfigError(f"kubeconfig {path}{origin} is not a valid kubeconfig: {problem}",
                          hint="it needs apiVersion: v1, kind: Config and lists of clusters, users and contexts; "
                               + KUBECONFIG_HINT) from None
    names = [c["name"] for c in contexts or []]
    name = context or (active or {}).get("name")
    if not name or name not in names:
        raise ConfigError(
            f"kubeconfig {path} has no context {name!r}" if name else f"kubeconfig {path} has no current context",
            hint=f"pick one of: {', '.join(names) or '(none)'} (jobgen submit --context, ${ENV_CONTEXT} or kubernetes.context in the profile)",
        )
    try:
        api = kube_config.new_client_from_config(config_file=path, context=name, persist_config=False)
    except (ConfigException, OSError, ValueError) as exc:
        raise ConfigError(f"kubeconfig {path}, context {name!r}: {exc}", hint="check the context's cluster and user entries") from None
    return Cluster(api, name)
