#!/usr/bin/env python3
"""The chat page of `slm serve` (GET /, src/slm/server/web_page.cpp) in headless Chromium, driven by selenium.

Usage: chat_page.py SLM_BINARY SOURCE_DIR SCREENSHOT_PNG
Starts `slm serve` on a free port with the shipped ensemble (models/ensemble.json: eight NVFP4 specialists and the
router, loaded in seconds; the tiny recipe on random weights where a checkout has no models/), opens the page, sets
temperature 0, types a prompt and sends it, then waits (WebDriverWait, with a deadline) until the assistant's bubble
holds the answer the API gives for the same request, streamed: the page's text is seen growing through more than one
state, each a prefix of the answer. The bubble must name the specialist that answered (the X-SLM-Specialist header,
the router's pick). Saves a screenshot of the page at the end. Fails (exit 1) naming scripts/test-deps.sh when
selenium, chromium or chromedriver is missing.
"""
import json
import os
import shutil
import sys
import tempfile

from slm_serve import SlmServe, require, tiny_model_args

require("selenium")
from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import TimeoutException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

PROMPT = "How do I add a library to a CMake target?"
MAX_TOKENS = 40
DEADLINE_S = 90  # for the answer to stream in; it takes about a second

# Records every text the assistant's bubble shows, as the page changes it (a MutationObserver, no polling).
RECORD = """
window.__states = [];
new MutationObserver(() => {
  const b = [...document.querySelectorAll('#log .msg')].pop();
  if (!b || b.classList.contains('user')) return;
  const t = b.querySelector('span').textContent, s = window.__states;
  if (!s.length || s[s.length - 1] !== t) s.push(t);
}).observe(document.getElementById('log'), {subtree: true, childList: true, characterData: true});
"""
# The assistant's bubble as the page shows it, or null before there is one.
BUBBLE = """
const b = [...document.querySelectorAll('#log .msg')].pop();
if (!b || b.classList.contains('user')) return null;
return {cls: b.className, who: b.querySelector('.who').textContent, text: b.querySelector('span').textContent};
"""


def browser_paths():
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver") or next(
        (p for p in ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver") if os.path.exists(p)), None)
    if not chromium or not driver:
        print(f"FAILED: chromium ({chromium}) or chromedriver ({driver}) not found: run scripts/test-deps.sh, which "
              "installs Debian's chromium and chromium-driver")
        sys.exit(1)
    return chromium, driver


def main():
    slm, src, screenshot = sys.argv[1], sys.argv[2], sys.argv[3]
    chromium, chromedriver = browser_paths()
    os.environ["SE_OFFLINE"] = "true"  # selenium must not look for browsers or drivers on the network
    shipped = f"{src}/models/ensemble.json"
    model = ["--ensemble", shipped] if os.path.exists(shipped) else tiny_model_args(src)
    with SlmServe(slm, model) as server, tempfile.TemporaryDirectory() as profile:
        # What the page must end up showing: the same request through the API.
        status, _, raw = server.post("/v1/chat/completions", {
            "model": "auto", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": MAX_TOKENS,
            "temperature": 0})
        assert status == 200, raw
        reference = json.loads(raw)
        expected, specialist = reference["choices"][0]["message"]["content"], reference["specialist"]
        assert expected.strip(), f"the greedy answer is blank, nothing to see on the page: {reference}"
        assert specialist in [m["id"] for m in server.get_json("/v1/models")["data"]], specialist

        opts = webdriver.ChromeOptions()
        opts.binary_location = chromium
        for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--no-first-run",
                  "--disable-extensions", "--force-device-scale-factor=1", "--window-size=1000,620",
                  f"--user-data-dir={profile}"):
            opts.add_argument(a)
        driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=opts)
        try:
            driver.set_page_load_timeout(60)
            driver.get(server.url + "/")
            assert driver.title == "SLM Ensemble chat", driver.title
            wait = WebDriverWait(driver, DEADLINE_S, poll_frequency=0.05)
            # The page lists the models (GET /v1/models) and picks auto.
            wait.until(lambda d: d.execute_script("return document.getElementById('model').value") == "auto")
            for field, value in (("max", MAX_TOKENS), ("temp", 0)):
                e = driver.find_element(By.ID, field)
                e.clear()
                e.send_keys(str(value))
            driver.execute_script(RECORD)
            driver.find_element(By.ID, "input").send_keys(PROMPT)
            driver.find_element(By.ID, "send").click()

            def answered(d):
                b = d.execute_script(BUBBLE)
                if b and "error" in b["cls"]:
                    raise AssertionError(f"the page shows an error: {b['text']!r}")
                return b if b and b["text"] == expected else None

            try:
                bubble = wait.until(answered)
            except TimeoutException:
                raise AssertionError(f"after {DEADLINE_S} s the page shows {driver.execute_script(BUBBLE)}, "
                                     f"not the answer {expected!r}; states seen: "
                                     f"{driver.execute_script('return window.__states')}") from None
            assert bubble["who"] == f"assistant: {specialist}", bubble
            states = driver.execute_script("return window.__states")
            assert all(expected.startswith(s) for s in states), states
            shown = [s for s in states if s]
            assert len(shown) >= 2, f"the answer appeared at once, not streamed: {states}"
            user = driver.find_elements(By.CSS_SELECTOR, "#log .msg.user span")
            assert [u.text for u in user] == [PROMPT], [u.text for u in user]
            assert driver.find_element(By.ID, "input").get_attribute("value") == ""
            driver.execute_script("document.activeElement.blur()")
            os.makedirs(os.path.dirname(os.path.abspath(screenshot)), exist_ok=True)
            partial = f"{screenshot}.{os.getpid()}.tmp.png"  # two runs at once never leave half a file
            assert driver.save_screenshot(partial), partial
            os.replace(partial, screenshot)
        finally:
            driver.quit()
    print(f"OK: the chat page streamed {len(expected)} characters in {len(shown)} steps from {specialist} "
          f"(Chromium {driver.capabilities.get('browserVersion', '?')}); screenshot {screenshot}")


if __name__ == "__main__":
    main()
