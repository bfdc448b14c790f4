"""busyguard_flag against a local stand-in for the API server: the exact PATCHes, and what a
refusal means for the task. Run: python3 -m unittest discover -s helpers/python (or name this
file: python3 -m unittest helpers/python/test_busyguard_flag.py)"""

import http.server
import json
import os
import sys
import threading
import unittest

# Beside this file, however the tests are started.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import busyguard_flag  # noqa: E402


class StandIn(http.server.BaseHTTPRequestHandler):
    """Records each PATCH; answers with the next scripted (status, body), else 200."""

    calls = []
    answers = []

    def do_PATCH(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        StandIn.calls.append((self.path, self.headers["Content-Type"], json.loads(body)))
        status, answer = StandIn.answers.pop(0) if StandIn.answers else (200, {"kind": "Pod"})
        payload = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


def refusal(code, cause, message):
    return code, {"kind": "Status", "status": "Failure", "code": code, "message": message,
                  "details": {"causes": [{"reason": cause}]}}


class FlagTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = http.server.HTTPServer(("127.0.0.1", 0), StandIn)
        threading.Thread(target=cls.server.serve_forever, daemon=True).start()

    @classmethod
    def tearDownClass(cls):
        cls.server.shutdown()

    def setUp(self):
        StandIn.calls.clear()
        StandIn.answers.clear()
        os.environ.update({
            "BUSYGUARD_API_URL": f"http://127.0.0.1:{self.server.server_address[1]}",
            "POD_NAME": "worker-1",
            "POD_NAMESPACE": "jobs",
        })

    def flips(self):
        return [(path, kind, body["metadata"]["labels"]["busyguard.io/busy"]) for path, kind, body in StandIn.calls]

    def test_busy_while_the_task_runs_and_idle_after(self):
        with busyguard_flag.busy():
            self.assertEqual(self.flips(), [("/api/v1/namespaces/jobs/pods/worker-1",
                                             "application/merge-patch+json", "true")])
        self.assertEqual([value for _, _, value in self.flips()], ["true", "false"])

    def test_idle_again_even_when_the_task_fails(self):
        with self.assertRaises(RuntimeError):
            with busyguard_flag.busy():
                raise RuntimeError("the task failed")
        self.assertEqual([value for _, _, value in self.flips()], ["true", "false"])

    def test_a_failed_flip_back_is_retried(self):
        busyguard_flag.IDLE_RETRY_PAUSE = 0.01
        StandIn.answers.extend([(200, {"kind": "Pod"}), refusal(503, "ServiceUnavailable", "try again")])
        with busyguard_flag.busy():
            pass
        self.assertEqual([value for _, _, value in self.flips()], ["true", "false", "false"])

    def test_a_failed_flip_back_after_a_failed_task_leaves_the_tasks_own_error(self):
        busyguard_flag.IDLE_RETRY_PAUSE = 0.01
        down = refusal(503, "ServiceUnavailable", "down")
        StandIn.answers.extend([(200, {"kind": "Pod"})] + [down] * busyguard_flag.IDLE_ATTEMPTS)
        with self.assertLogs("busyguard_flag", "WARNING") as logged:
            with self.assertRaises(RuntimeError):
                with busyguard_flag.busy():
                    raise RuntimeError("the task failed")
        self.assertIn("stays busy until max-busy", logged.output[0])
        self.assertEqual(len(StandIn.calls), 1 + busyguard_flag.IDLE_ATTEMPTS)

    def test_a_failed_flip_back_after_a_task_that_succeeded_is_a_flag_error(self):
        busyguard_flag.IDLE_RETRY_PAUSE = 0.01
        down = refusal(503, "ServiceUnavailable", "down")
        StandIn.answers.extend([(200, {"kind": "Pod"})] + [down] * busyguard_flag.IDLE_ATTEMPTS)
        with self.assertRaises(busyguard_flag.FlagError):
            with busyguard_flag.busy():
                pass

    def test_a_pod_being_deleted_refuses_the_flip_and_the_task_does_not_start(self):
        StandIn.answers.append(refusal(409, "BusyguardPodTerminating", "pod jobs/worker-1 is being deleted"))
        started = []
        with self.assertRaises(busyguard_flag.PodTerminating) as refused:
            with busyguard_flag.busy():
                started.append(True)
        self.assertEqual(started, [], "the task must not start")
        self.assertIn("is being deleted", str(refused.exception))
        self.assertEqual(len(StandIn.calls), 1, "nothing to take back: the pod never turned busy")

    def test_a_pod_whose_drain_is_under_way_refuses_the_flip_and_says_why(self):
        for cause in ("BusyguardDisruptionWanted", "BusyguardNodeGoing"):
            StandIn.calls.clear()
            StandIn.answers.append(refusal(409, cause, "pod jobs/worker-1 takes no new task: ..."))
            started = []
            with self.assertRaises(busyguard_flag.PodGoing) as refused:
                with busyguard_flag.busy():
                    started.append(True)
            self.assertEqual(started, [], "the task must not start")
            self.assertEqual(refused.exception.cause, cause)
            self.assertEqual(len(StandIn.calls), 1, "nothing to take back: the pod never turned busy")

    def test_any_other_refusal_is_a_flag_error(self):
        StandIn.answers.append(refusal(403, "Forbidden", "cannot patch pods"))
        with self.assertRaises(busyguard_flag.FlagError) as refused:
            busyguard_flag.busy()
        self.assertNotIsInstance(refused.exception, busyguard_flag.PodGoing)
        self.assertIn("refused (403): cannot patch pods", str(refused.exception))

    def test_without_its_name_the_pod_cannot_flag_itself(self):
        del os.environ["POD_NAME"]
        with self.assertRaises(busyguard_flag.FlagError):
            busyguard_flag.idle()
        self.assertEqual(StandIn.calls, [])

    def test_an_unreachable_api_server_is_a_flag_error(self):
        os.environ["BUSYGUARD_API_URL"] = "http://127.0.0.1:9"
        with self.assertRaises(busyguard_flag.FlagError):
            busyguard_flag.busy(timeout=2)


if __name__ == "__main__":
    unittest.main()


class TryItOutsideAPod(unittest.TestCase):
    def test_a_ca_file_that_is_not_there_is_said_plainly(self):
        os.environ["BUSYGUARD_API_CA"] = "/no/such/ca.crt"
        try:
            with self.assertRaises(busyguard_flag.FlagError) as refused:
                busyguard_flag._tls_context("https://127.0.0.1:6443")
            self.assertIn("/no/such/ca.crt", str(refused.exception))
        finally:
            del os.environ["BUSYGUARD_API_CA"]

