"""``notify:`` of a training spec: the webhook and/or command notified on started, restart,
requeued, finished and failed; credentials only by reference. No I/O."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from jobgen.specs.base import ENV_KEY_RE, _Model, check_shell_safe, url_credential

NotifyEvent = Literal["started", "restart", "requeued", "finished", "failed"]
NOTIFY_EVENTS: tuple[NotifyEvent, ...] = ("started", "restart", "requeued", "finished", "failed")

class WebhookSpec(_Model):
    """An HTTP(S) endpoint that gets each notification as a JSON body (``POST``,
    ``Content-Type: application/json``). Credentials only by reference: the token is read from
    an environment variable on the node (``token_env``) and sent as ``Authorization: Bearer``."""

    url: str | None = Field(default=None, description=(
        "``http://`` or ``https://`` URL the JSON body is POSTed to. Written into spec.json, so it may\n"
        "not carry a credential: user:password@ and query parameters named like token/key/secret/\n"
        "sig are refused (use ``token_env``, or ``url_env`` for URLs that are secrets themselves)."
    ))
    url_env: str | None = Field(default=None, description=(
        "Name of an environment variable that holds the URL, for URLs that are credentials\n"
        "themselves (e.g. Slack incoming webhooks); must also be listed in the spec's ``secrets``.\n"
        "Exactly one of ``url`` and ``url_env``."
    ))
    token_env: str | None = Field(default=None, description=(
        "Name (never the value) of an environment variable holding a bearer token, sent as\n"
        "``Authorization: Bearer <token>``; must also be listed in the spec's ``secrets`` so that it\n"
        "reaches the ranks. ``null``: no Authorization header."
    ))

    @field_validator("url")
    @classmethod
    def _url_without_credentials(cls, value: str | None) -> str | None:
        if value is None:
            return None
        from urllib.parse import urlsplit

        check_shell_safe(value)
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{value!r} is not an http:// or https:// URL with a host")
        # What urllib sends (http.client): no blank or control character anywhere (InvalidURL), and
        # ASCII only but in the host name (UnicodeEncodeError; a host name is IDNA-encoded).
        bad = sorted({c for c in value if c <= " " or c == "\x7f" or (not c.isascii() and c not in parts.netloc)}
                     | {c for c in parts.netloc if not c.isprintable() or c.isspace()})
        if bad:
            from urllib.parse import quote

            encoded = quote(value, safe=":/?#[]@!$&'()*+,;=%~")
            raise ValueError(f"the URL holds {''.join(bad)!r}, which the notification's HTTP request cannot carry "
                             f"(it would fail when the run sends it); percent-encode it: {encoded}")
        credential = url_credential(value)
        if credential:
            raise ValueError(f"{credential}; it would be written into spec.json (and committed). Send the token by "
                             "reference instead: token_env: <VARIABLE> (listed in secrets), or give the whole URL by url_env")
        return value

    @field_validator("url_env", "token_env")
    @classmethod
    def _env_names(cls, value: str | None) -> str | None:
        if value is not None and not ENV_KEY_RE.match(value):
            raise ValueError(f"{value!r} is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*); "
                             "give the variable's NAME, never its value")
        return value

    @model_validator(mode="after")
    def _one_url(self) -> WebhookSpec:
        if (self.url is None) == (self.url_env is None):
            raise ValueError("give exactly one of url and url_env")
        return self


class NotifySpec(_Model):
    """Notifications about the run, sent by global rank zero: a webhook and/or a command, each
    getting the same JSON body (event, job, handle, step, losses, GPU-hours, time). A failed
    notification warns on stderr and never fails or stops training."""

    webhook: WebhookSpec | None = Field(default=None, description="POST the JSON body to this URL.")
    command: tuple[str, ...] | None = Field(default=None, description=(
        "Run this argv (no shell) on rank zero's node with the JSON body on stdin, e.g.\n"
        "``[/usr/local/bin/notify-team, --channel, ml]``."
    ))
    events: tuple[NotifyEvent, ...] = Field(default=NOTIFY_EVENTS, description=(
        "Which events to send: ``started`` (each start, also after a requeue), ``restart`` (a restart\n"
        "within ``restart.max_restarts``: its class, reason, restarts used and the budget), ``requeued`` (the job\n"
        "checkpointed and requeued itself on SLURM's signal), ``finished`` (max_steps reached),\n"
        "``failed`` (the entrypoint raised or stopped early)."
    ))
    timeout_s: float = Field(default=10.0, gt=0.0, le=120.0, description=(
        "Seconds one attempt may take (HTTP request or command); a failed attempt is retried once."
    ))

    @field_validator("command")
    @classmethod
    def _command_argv(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is not None:
            if not value or not value[0].strip():
                raise ValueError("command needs at least the program, e.g. [/usr/local/bin/notify-team]")
            for arg in value:
                check_shell_safe(arg)
        return value

    @field_validator("events")
    @classmethod
    def _some_events(cls, value: tuple[NotifyEvent, ...]) -> tuple[NotifyEvent, ...]:
        if not value:
            raise ValueError(f"give at least one event of {', '.join(NOTIFY_EVENTS)} (or remove notify)")
        return value

    @model_validator(mode="after")
    def _a_target(self) -> NotifySpec:
        if self.webhook is None and self.command is None:
            raise ValueError("notify needs a webhook ({url: ...}) or a command ([argv ...]), or both")
        return self
