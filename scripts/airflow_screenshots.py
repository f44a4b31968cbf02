"""Take the README's screenshots of the real Airflow UI in headless Chromium, and do what they show.

With Airflow running (`make airflow`) and two stored crawls (`pretrain crawl --snapshot 2026-03-01`, ...),
this logs in, runs a backfill of `reprocess_corpus` over the two dates through the backfill form, then
triggers `pretrain` through its form on the first date, waits for both, and saves:

  docs/img/airflow-backfill.png          the backfill form, filled in
  docs/img/airflow-backfill-runs.png     reprocess_corpus after the backfill
  docs/img/airflow-trigger-pretrain.png  the pretrain trigger form, filled in
  docs/img/airflow-pretrain-run.png      the pretrain run
  docs/img/airflow-dags.png              the DAG list

Playwright is not a project dependency; run this from a separate environment:

  python3 -m venv /tmp/shots && /tmp/shots/bin/pip install playwright
  apt-get install chromium
  /tmp/shots/bin/python scripts/airflow_screenshots.py --url http://127.0.0.1:8080
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request
from pathlib import Path

from playwright.sync_api import Page, sync_playwright

PROJECT_ROOT = Path(__file__).resolve().parents[1]
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


class Rest:
    def __init__(self, url: str, password: str) -> None:
        self.url = url
        body = json.dumps({"username": "admin", "password": password}).encode()
        request = urllib.request.Request(
            f"{url}/auth/token", data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request) as response:
            self.token = json.loads(response.read())["access_token"]

    def get(self, path: str):
        request = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(request) as response:
            return json.loads(response.read())

    def wait_runs(self, dag_id: str, run_type: str, count: int, deadline_s: float = 1800) -> list[dict]:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            runs = self.get(f"/api/v2/dags/{dag_id}/dagRuns?run_type={run_type}&limit=20")["dag_runs"]
            if len(runs) >= count and all(r["state"] in ("success", "failed") for r in runs):
                return runs
            time.sleep(5)
        raise TimeoutError(f"{dag_id}: runs did not finish")

    def wait_backfills(self, dag_id: str, deadline_s: float = 300) -> None:
        """The scheduler marks a backfill completed a little after its last run ends."""
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            backfills = self.get(f"/api/v2/backfills?dag_id={dag_id}")["backfills"]
            if all(b["completed_at"] for b in backfills):
                return
            time.sleep(2)
        raise TimeoutError(f"{dag_id}: backfill not completed")


def login(page: Page, url: str, password: str) -> None:
    page.goto(url + "/")
    page.get_by_label("Username").fill("admin")
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_load_state("networkidle")


def open_trigger(page: Page, url: str, dag_id: str):
    page.goto(f"{url}/dags/{dag_id}")
    page.wait_for_load_state("networkidle")
    page.get_by_role("button", name="Trigger").click()
    dialog = page.get_by_role("dialog")
    dialog.wait_for()
    return dialog


def pick_datetime(page: Page, trigger, date: str) -> None:
    trigger.click()
    page.get_by_placeholder("YYYY/MM/DD").last.fill(date)
    page.get_by_placeholder("HH:mm").last.fill("00:00")
    page.keyboard.press("Escape")


def open_section(page: Page, dialog, name: str) -> None:
    dialog.get_by_role("button", name=name, exact=True).click()
    page.wait_for_timeout(500)


def choose(page: Page, dialog, label: str, option: str) -> None:
    field = dialog.locator("label", has_text=label).get_attribute("for")
    dialog.locator(f"[id='{field}']").click()
    page.get_by_role("option", name=option, exact=True).click()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--airflow-home", default=str(PROJECT_ROOT / ".airflow"))
    parser.add_argument("--out", default=str(PROJECT_ROOT / "docs" / "img"))
    parser.add_argument("--dates", nargs=2, default=["2026-03-01", "2026-03-02"])
    parser.add_argument("--forms-only", action="store_true", help="fill and shoot the forms, submit nothing")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    password = json.loads(
        (Path(args.airflow_home) / "simple_auth_manager_passwords.json.generated").read_text()
    )["admin"]
    rest = Rest(args.url, password)

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1350})
        login(page, args.url, password)

        # A backfill of reprocess_corpus over the stored crawls, through the UI's backfill form.
        dialog = open_trigger(page, args.url, "reprocess_corpus")
        dialog.get_by_text("Run this Dag for a range of dates").click()
        pickers = dialog.get_by_test_id("datetime-input")
        pick_datetime(page, pickers.nth(0), args.dates[0].replace("-", "/"))
        pick_datetime(page, pickers.nth(1), args.dates[1].replace("-", "/"))
        dialog.locator("input[name=max_active_runs]").fill("2")
        page.wait_for_timeout(1000)
        page.screenshot(path=str(out / "airflow-backfill.png"))
        if not args.forms_only:
            dialog.get_by_role("button", name="Run Backfill").click()
            rest.wait_runs("reprocess_corpus", "backfill", 2)
            rest.wait_backfills("reprocess_corpus")
        page.goto(f"{args.url}/dags/reprocess_corpus/runs")
        page.wait_for_load_state("networkidle")
        page.wait_for_timeout(1500)
        page.screenshot(path=str(out / "airflow-backfill-runs.png"))

        # Train on the first date through the pretrain form.
        dialog = open_trigger(page, args.url, "pretrain")
        # The form's sections open one at a time; fill each, and end on Training for the picture.
        open_section(page, dialog, "Model")
        choose(page, dialog, "Model preset", "tiny")
        choose(page, dialog, "Precision", "fp32")
        open_section(page, dialog, "Tracking")
        dialog.locator("input[name=element_mlflow_experiment]").fill("ui-demo")
        open_section(page, dialog, "Data and config")
        dialog.locator("input[name=element_snapshot]").fill(args.dates[0])
        open_section(page, dialog, "Training")
        dialog.locator("input[name=element_steps]").fill("30")
        dialog.locator("input[name=element_nodes]").fill("1")
        dialog.locator("input[name=element_processes_per_node]").fill("2")
        page.wait_for_timeout(1000)
        page.screenshot(path=str(out / "airflow-trigger-pretrain.png"), full_page=True)
        if not args.forms_only:
            dialog.get_by_role("button", name="Trigger").click()
            rest.wait_runs("pretrain", "manual", 1)
        page.goto(f"{args.url}/dags/pretrain")
        page.wait_for_load_state("networkidle")
        page.wait_for_timeout(1500)
        page.screenshot(path=str(out / "airflow-pretrain-run.png"))

        page.goto(f"{args.url}/dags")
        page.wait_for_load_state("networkidle")
        page.wait_for_timeout(1500)
        page.screenshot(path=str(out / "airflow-dags.png"))
        browser.close()
    for name in sorted(out.glob("airflow-*.png")):
        print(name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
