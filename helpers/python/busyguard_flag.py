"""Flip this pod's busyguard.io/busy label from inside the pod, with the standard library only.

    import busyguard_flag

    busyguard_flag.idle()            # at start: a flag left from before a restart does not protect
    with busyguard_flag.busy():      # busy while the block runs, idle after, even if it raises
        run_the_task()

If the flip to busy is refused, busy() raises and the block does not run: PodGoing when busyguard
says the pod is on its way out, with the cause in `.cause` (BusyguardPodTerminating: already
being deleted; BusyguardDisruptionWanted: a drain or an autoscaler asked to evict it, or a delete
waits for it to be idle; BusyguardNodeGoing: its node is being taken away), FlagError for
anything else (no permission, API server unreachable). Either way the task must not start: the
pod goes at this idle moment, or is not protected. A worker on a queue simply asks again later:
the refusals of a drain that was called off end by themselves.

The flip back to idle is tried IDLE_ATTEMPTS times. If it still fails, the pod stays busy until
busyguard's max-busy: after a task that succeeded, busy() raises FlagError on exit; after a task
that raised, the task's own exception goes on and the failed flip is logged.

The pod needs POD_NAME and POD_NAMESPACE (from the downward API; the namespace may also come from
the service account's files) and a service account allowed to patch pods in its namespace.
BUSYGUARD_API_URL overrides the API server's address (tests, or a proxy), and BUSYGUARD_API_CA
the CA it is trusted by. To try it outside a pod: `kubectl proxy`, then
BUSYGUARD_API_URL=http://127.0.0.1:8001 POD_NAME=... POD_NAMESPACE=... python3 your_worker.py.
"""

import contextlib
import json
import logging
import os
import ssl
import time
import urllib.error
import urllib.request

LABEL = "busyguard.io/busy"
SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
TERMINATING_CAUSE = "BusyguardPodTerminating"
# busyguard's causes for a refused flip to busy: the pod is going, do not start the task.
GOING_CAUSES = (TERMINATING_CAUSE, "BusyguardDisruptionWanted", "BusyguardNodeGoing")
IDLE_ATTEMPTS = 3
IDLE_RETRY_PAUSE = 1.0  # seconds, doubled after each failed attempt


class FlagError(Exception):
    """The flag could not be set: the pod is not protected."""


class PodGoing(FlagError):
    """busyguard refused the flip: the pod is going (see .cause); do not start the task."""

    def __init__(self, message, cause):
        super().__init__(message)
        self.cause = cause


# The name of 0.2's refusal, kept for callers that catch it: every PodGoing is one now.
PodTerminating = PodGoing


def busy(timeout=10):
    """Marks this pod busy; a context manager that marks it idle again on exit."""
    _flip("true", timeout)
    return _idle_on_exit(timeout)


def idle(timeout=10):
    """Marks this pod idle."""
    _flip("false", timeout)


@contextlib.contextmanager
def _idle_on_exit(timeout):
    try:
        yield
    except BaseException:
        # The task's own error comes first; a failed flip back is only logged.
        try:
            _idle_retrying(timeout)
        except FlagError as e:
            logging.getLogger(__name__).warning("the pod stays busy until max-busy: %s", e)
        raise
    _idle_retrying(timeout)


def _idle_retrying(timeout):
    for attempt in range(IDLE_ATTEMPTS):
        try:
            idle(timeout)
            return
        except FlagError:
            if attempt == IDLE_ATTEMPTS - 1:
                raise
            time.sleep(IDLE_RETRY_PAUSE * 2**attempt)


def _flip(value, timeout):
    name = os.environ.get("POD_NAME")
    namespace = os.environ.get("POD_NAMESPACE") or _read(os.path.join(SERVICE_ACCOUNT, "namespace"))
    if not name or not namespace:
        raise FlagError("POD_NAME and POD_NAMESPACE must be set (downward API)")
    base = os.environ.get("BUSYGUARD_API_URL") or _in_cluster_url()
    url = f"{base}/api/v1/namespaces/{namespace}/pods/{name}"
    body = json.dumps({"metadata": {"labels": {LABEL: value}}}).encode()
    request = urllib.request.Request(url, data=body, method="PATCH")
    request.add_header("Content-Type", "application/merge-patch+json")
    token = _read(os.path.join(SERVICE_ACCOUNT, "token"))
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=_tls_context(base)) as response:
            response.read()
    except urllib.error.HTTPError as refused:
        status = _status(refused)
        message = status.get("message") or refused.reason
        causes = [c.get("reason") for c in (status.get("details") or {}).get("causes") or []]
        going = [cause for cause in causes if cause in GOING_CAUSES]
        if refused.code == 409 and going:
            raise PodGoing(message, going[0]) from None
        raise FlagError(f"{LABEL}={value} refused ({refused.code}): {message}") from None
    except (urllib.error.URLError, OSError) as unreachable:
        raise FlagError(f"{LABEL}={value} not set: {unreachable}") from None


def _in_cluster_url():
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    if not host:
        raise FlagError("not in a cluster (no KUBERNETES_SERVICE_HOST) and no BUSYGUARD_API_URL")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    host = f"[{host}]" if ":" in host else host
    return f"https://{host}:{port}"


def _tls_context(base):
    if not base.startswith("https://"):
        return None
    given = os.environ.get("BUSYGUARD_API_CA")
    if given and not os.path.exists(given):
        raise FlagError(f"BUSYGUARD_API_CA={given}: no such file")
    ca = given or os.path.join(SERVICE_ACCOUNT, "ca.crt")
    return ssl.create_default_context(cafile=ca if os.path.exists(ca) else None)


def _status(error):
    try:
        return json.loads(error.read() or b"{}")
    except ValueError:
        return {}


def _read(path):
    try:
        with open(path, encoding="utf-8") as file:
            return file.read().strip()
    except OSError:
        return None
