"""The standalone cluster that the cluster tests and benchmark start (``tests/support/
spark_cluster.py``): while the master starts, its UI may answer the status page with HTML; the
wait for the workers treats that as not up yet instead of failing."""

import http.server
import json
import threading

from support.spark_cluster import Cluster

HTML = b"<!DOCTYPE html><html><body>Spark Master</body></html>"
STATUS = {"workers": [{"state": "ALIVE"}, {"state": "DEAD"}, {"state": "ALIVE"}]}


def test_a_status_page_answered_with_html_counts_as_not_up_yet(tmp_path):
    answers = [HTML, json.dumps(STATUS).encode()]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = answers.pop(0) if len(answers) > 1 else answers[0]
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        c = Cluster(workdir=tmp_path)
        c.master_ui = f"http://127.0.0.1:{server.server_address[1]}"
        assert not c.registered(2)  # the HTML page
        assert c.registered(2)
        assert not c.registered(3)
    finally:
        server.shutdown()
        server.server_close()
    assert not c.registered(2)  # nobody answers
