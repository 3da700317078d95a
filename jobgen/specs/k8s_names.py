"""Kubernetes name rules, in one place (k8s.io/apimachinery/pkg/util/validation/validation.go).

- DNS-1123 label: lower-case alphanumerics and ``-``, starting and ending alphanumeric, at most
  63 characters (namespaces, container names, most object names).
- DNS-1035 label: the same but starting with a letter (Service names; the training-operator's
  webhook requires it of PyTorchJob names, since each replica gets a Service).
- DNS-1123 subdomain: dot-separated DNS-1123 labels, at most 253 characters (Secrets, ConfigMaps).
- IANA service name (container port names): a DNS-1123 label of at most 15 characters with no
  ``--``.
"""

from __future__ import annotations

import re

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
#: Longest DNS label (RFC 1123).
MAX_LABEL = 63
#: Longest DNS subdomain (RFC 1123).
MAX_SUBDOMAIN = 253
#: Longest IANA service name (port names).
MAX_PORT_NAME = 15


def is_dns1123_label(value: object) -> bool:
    """True for a DNS-1123 label (see the module docstring)."""
    return isinstance(value, str) and len(value) <= MAX_LABEL and bool(DNS1123_LABEL.match(value))


def is_dns1035_label(value: object) -> bool:
    """True for a DNS-1035 label (a DNS-1123 label that starts with a letter)."""
    return isinstance(value, str) and len(value) <= MAX_LABEL and bool(DNS1035_LABEL.match(value))


def is_dns1123_subdomain(value: object) -> bool:
    """True for a DNS-1123 subdomain of at most 253 characters."""
    return isinstance(value, str) and len(value) <= MAX_SUBDOMAIN and bool(DNS1123_SUBDOMAIN.match(value))


def is_port_name(value: object) -> bool:
    """True for an IANA service name usable as a container port name."""
    return isinstance(value, str) and len(value) <= MAX_PORT_NAME and "--" not in value and bool(DNS1123_LABEL.match(value))
