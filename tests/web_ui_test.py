#!/usr/bin/python3
"""The web page (server/web/, docs/web.md) in a real browser: Debian's chromium, headless, driven
by chromium-driver through python3-selenium, against a real krause-server on the bundled models
with bearer tokens on. What the page shows is checked against krause.v1 over gRPC (Debian's
grpcio, messages built at run time from proto/krause/v1/krause.proto):
  - the page asks for the token once, then lists the four models;
  - Fashion-MNIST test images uploaded to the pad keep their pixels, and the label shown is
    Classify's;
  - the attention overlay's kept keys, for a patch clicked as the query, are Inspect's;
  - a generation with a fixed seed and class paints exactly Generate's pixels, its Save PNG is
    Generate's PNG, and the commands shown repeat it;
  - Stop mid-generation: the server's cache slots return to 0;
  - a bad value (guidance "NaN", an unknown class) shows the server's own message next to the
    control it names, and the page keeps working;
  - Complete (a prompt the page encodes as PNG itself) equals Generate with that prompt; Score's
    figures are Score's;
  - every control has a label; at phone width nothing runs off the page.
With a third argument, screenshots of each panel go to that folder (docs/web/ holds the ones the
README shows: `web_ui_test.py build/bin . docs/web`).
Usage: web_ui_test.py BIN_DIR SOURCE_DIR [SCREENSHOT_DIR]
"""
import base64
import os
import re
import subprocess
import sys
import tempfile
import urllib.request

import grpc

from e2e import (check, classes, collect_generation, free_port, png, report, test_images,
                 wait_ready)

BIN, SRC = sys.argv[1], sys.argv[2]
SHOTS = sys.argv[3] if len(sys.argv) > 3 else None
TOKEN = "web-secret"
AUTH = [("authorization", f"Bearer {TOKEN}")]
CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def main():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        print("FAIL python3-selenium is missing: run scripts/install-deps.sh")
        return 1
    for path in (CHROMIUM, DRIVER):
        if not os.path.exists(path):
            print(f"FAIL {path} is missing: run scripts/install-deps.sh (chromium, chromium-driver)")
            return 1
    tmp = tempfile.mkdtemp(prefix="web-ui-")
    native = classes(tmp, os.path.join(SRC, "proto"), "krause/v1/krause.proto", "krause.v1",
                     ["Image", "ClassifyRequest", "ClassifyResponse", "GenerateRequest",
                      "GenerateResponse", "ScoreRequest", "ScoreResponse", "InspectRequest",
                      "InspectResponse"])
    tokens = os.path.join(tmp, "tokens")
    open(tokens, "w").write(TOKEN + "\n")
    port, hport, mport = free_port(), free_port(), free_port()
    server = subprocess.Popen(
        [os.path.join(BIN, "krause-server"), "--models_dir", os.path.join(SRC, "models"),
         f"--listen=127.0.0.1:{port}", f"--http_listen=127.0.0.1:{hport}",
         f"--metrics_listen=127.0.0.1:{mport}", f"--auth_tokens={tokens}", "--threads=2",
         "--drain_seconds=2", "--quiet"])
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              "--window-size=1100,3000", "--hide-scrollbars"):
        options.add_argument(a)
    driver = None
    try:
        driver = webdriver.Chrome(service=Service(DRIVER), options=options)
        check(wait_ready(f"http://127.0.0.1:{hport}"), "the server is ready")
        run(driver, native, tmp, port, hport, mport)
    finally:
        if driver is not None:
            driver.quit()
        server.terminate()
        server.wait(timeout=30)
    return report("web page")


def run(driver, native, tmp, port, hport, mport):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    page = f"http://127.0.0.1:{hport}/"
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    ser = lambda m: m.SerializeToString()
    unary = lambda name: channel.unary_unary(f"/krause.v1.KrauseService/{name}", ser,
                                             native[f"{name}Response"].FromString)
    classify, score, inspect = unary("Classify"), unary("Score"), unary("Inspect")
    generate = channel.unary_stream("/krause.v1.KrauseService/Generate", ser,
                                    native["GenerateResponse"].FromString)
    el = lambda css: driver.find_element(By.CSS_SELECTOR, css)
    js = driver.execute_script

    def wait(condition, what, seconds=60):
        try:
            return WebDriverWait(driver, seconds, poll_frequency=0.05).until(lambda d: condition())
        except Exception:  # a timeout: the check fails, the test goes on
            check(False, f"{what} (waited {seconds} s)")
            return None

    def shot(section, name):
        if SHOTS:
            os.makedirs(SHOTS, exist_ok=True)
            el(f"#{section}").screenshot(os.path.join(SHOTS, name))

    def canvas_pixels(canvas):  # the grey value (red channel) of each pixel, row-major
        return bytes(js("const c = arguments[0], d = c.getContext('2d')"
                        ".getImageData(0, 0, c.width, c.height).data;"
                        "return Array.from(d.filter((_, i) => i % 4 === 0));", canvas))

    def raw(pixels):
        im = native["Image"]()
        im.raw.pixels, im.raw.height, im.raw.width, im.raw.channels = pixels, 28, 28, 1
        return im

    def upload(pad, pixels, name):
        path = os.path.join(tmp, name)
        open(path, "wb").write(png(28, 28, pixels))
        el(f"#{pad} input[type=file]").send_keys(path)

    def set_text(css, text):
        field = el(css)
        field.clear()
        if text:
            field.send_keys(text)

    def native_images(request, n):  # pixels, PNGs and seeds, per image
        return collect_generation(generate(request, metadata=AUTH, timeout=120), n)

    def slots_in_use():
        with urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=10) as r:
            text = r.read().decode()
        m = re.search(r'^krause_kv_cache_slots_in_use\{[^}]*model="karm-fmnist"[^}]*\} (\S+)$',
                      text, re.M)
        return float(m.group(1)) if m else -1

    # --- the token, once; then the models ---
    driver.get(page)
    wait(lambda: js("return document.getElementById('token-dialog').open"),
         "the page asks for a token when the server answers 401")
    el("#token-input").send_keys(TOKEN)
    el("#token-dialog button[value=save]").click()
    rows = wait(lambda: len(driver.find_elements(By.CSS_SELECTOR, "#model-table tbody tr")) == 4
                and driver.find_elements(By.CSS_SELECTOR, "#model-table tbody tr"),
                "the models table lists the four bundled models")
    if rows:
        text = el("#model-table").text
        check(all(n in text for n in ("krause-vit-fmnist", "vit-fmnist", "karm-fmnist", "arm-fmnist"))
              and "Krause (window" in text and "check passed" in text,
              "the models table shows each model's attention and kernel check")
    shot("models", "models.png")

    # --- classify: uploaded test images, the label krause.v1 gives ---
    images = test_images(4)
    for i in range(3):
        js("document.getElementById('classify-label').textContent = ''")
        upload("classify-pad", images[i], f"test-{i}.png")
        label = wait(lambda: el("#classify-label").text, f"a label for test image {i}")
        pad = canvas_pixels(el("#classify-pad canvas"))
        check(pad == images[i], f"test image {i} uploaded keeps its pixels on the pad")
        want = classify(native["ClassifyRequest"](model="krause-vit-fmnist", images=[raw(images[i])],
                                                  top_k=5), metadata=AUTH, timeout=30)
        check(label == want.results[0].top[0].label,
              f"test image {i}: the page shows Classify's label ({label!r}, "
              f"Classify: {want.results[0].top[0].label!r})")

    # --- what attention keeps: a clicked patch, against Inspect ---
    wait(lambda: el("#inspect-keys").text, "the attention overlay lists the kept keys")
    Select(el("#inspect-layer")).select_by_value("2")
    Select(el("#inspect-head")).select_by_value("1")
    canvas = el("#inspect-canvas")
    size = canvas.size
    row, col = 3, 4  # the patch clicked: the 7x7 grid's row 3, column 4
    ActionChains(driver).move_to_element_with_offset(
        canvas, int((col + 0.5) * size["width"] / 7 - size["width"] / 2),
        int((row + 0.5) * size["height"] / 7 - size["height"] / 2)).click().perform()
    query = int(el("#inspect-query").get_attribute("value"))
    shown = [int(k) for k in el("#inspect-keys").text.split(", ") if k]
    got = inspect(native["InspectRequest"](model="krause-vit-fmnist", image=raw(images[2]),
                                           layers=[2], queries=[query]), metadata=AUTH, timeout=30)
    check(got.token_rows[query] == row and got.token_columns[query] == col,
          f"clicking patch (3, 4) makes its token the query ({query})")
    want_keys = list(got.layers[0].heads[1].queries[0].keys)
    check(shown == want_keys and len(shown) > 0,
          f"the overlay's kept keys are Inspect's for layer 2, head 1, query {query}: {shown}")
    shot("classify", "classify.png")

    # --- generate: a fixed seed and class, pixel for pixel ---
    Select(el("#generate-class")).select_by_value("Sneaker")
    set_text("#generate-seed", "7")
    set_text("#generate-num", "2")
    Select(el("#generate-priority")).select_by_value("1")  # the same images, sooner in the tenant
    el("#generate-run").click()
    wait(lambda: "pixels in" in el("#generate-status").text, "the generation finishes")
    req = native["GenerateRequest"](model="karm-fmnist", num_images=2, seed=7, label="Sneaker")
    want, want_png, want_seed = native_images(req, 2)
    for i in range(2):
        got = canvas_pixels(el(f"#generate-images canvas[data-image='{i}']"))
        check(got == want[i], f"generated image {i} (seed 7, Sneaker): the canvas holds Generate's pixels")
        link = el(f"#generate-images figure:nth-child({i + 1}) a[download]").get_attribute("href")
        check(base64.b64decode(link.split(",", 1)[1]) == want_png[i],
              f"generated image {i}: Save PNG is Generate's PNG")
        caption = el(f"#generate-images figure:nth-child({i + 1}) figcaption").text
        check(caption.startswith(f"seed {want_seed[i]} "),
              f"generated image {i}: the caption shows its 64-bit seed exactly ({caption!r})")
    cli, curl = el("#generate-cli").get_attribute("textContent"), el("#generate-curl").get_attribute("textContent")
    check("--seed 7" in cli and "--label Sneaker" in cli and "--num 2" in cli and
          '"seed":7' in curl and '"label":"Sneaker"' in curl and "generate_stream" in curl and
          "--priority 1" in cli and '"priority":1' in curl,
          "the page shows the krause-client and curl commands of the same request")
    el("#generate-commands summary").click()
    shot("generate", "generate.png")
    Select(el("#generate-priority")).select_by_value("")

    # --- Stop: the server frees the cache slots ---
    set_text("#generate-seed", "11")
    set_text("#generate-num", "16")
    el("#generate-run").click()
    busy = wait(lambda: slots_in_use() > 0, "the generation holds cache slots while it runs")
    el("#generate-stop").click()
    wait(lambda: "stopped" in el("#generate-status").text, "Stop stops the stream on the page")
    check(bool(busy) and wait(lambda: slots_in_use() == 0, "slots return to 0", 10) is True,
          "after Stop the server's cache slots return to 0")

    # --- bad values: the server's message beside the control; the page goes on ---
    set_text("#generate-num", "1")
    set_text("#generate-guidance", "NaN")
    el("#generate-run").click()
    note = wait(lambda: driver.find_elements(By.CSS_SELECTOR, "#generate .field-error"),
                "an error appears in the Generate panel")
    status, body = rest_error(hport, "/v2/models/karm-fmnist/generate_stream",
                              b'{"guidance": "NaN", "label": "Sneaker", "seed": 11, "num_images": 1}')
    if note:
        check(note[0].text == body and status == 400 and "guidance" in body,
              f"guidance NaN: the server's message ({body!r}) is shown under the guidance field")
        check(el("#generate-guidance").get_attribute("aria-invalid") == "true",
              "the guidance field is marked invalid")
    set_text("#generate-guidance", "")
    set_text("#generate-seed", "7")
    el("#generate-run").click()
    wait(lambda: "pixels in" in el("#generate-status").text and
         not driver.find_elements(By.CSS_SELECTOR, "#generate .field-error"),
         "after an error the page generates again")
    check(canvas_pixels(el("#generate-images canvas[data-image='0']")) == want[0],
          "after an error the same request gives the same image")

    # --- score, and an unknown class ---
    upload("score-pad", images[0], "score.png")
    Select(el("#score-class")).select_by_value("Ankle boot")
    el("#score-run").click()
    figures = wait(lambda: "bits/dim" in el("#score-figures").text and el("#score-figures").text,
                   "Score shows bits/dim")
    got = score(native["ScoreRequest"](model="karm-fmnist", images=[raw(images[0])] * 2,
                                       labels=["", "Ankle boot"]), metadata=AUTH, timeout=30)
    if figures:
        check(f"{got.bits_per_dim[0]:.4f} bits/dim" in figures and
              f"{got.bits_per_dim[1]:.4f} bits/dim" in figures,
              f"the page's bits/dim are Score's ({got.bits_per_dim[0]:.4f}, {got.bits_per_dim[1]:.4f})")
    shot("score", "score.png")
    js("const s = document.getElementById('score-class'); s.add(new Option('Unicorn', 'Unicorn'));"
       "s.value = 'Unicorn';")
    el("#score-run").click()
    note = wait(lambda: driver.find_elements(By.CSS_SELECTOR, "#score .field-error"),
                "an unknown class shows an error in the Score panel")
    try:
        score(native["ScoreRequest"](model="karm-fmnist", images=[raw(images[0])] * 2,
                                     labels=["", "Unicorn"]), metadata=AUTH, timeout=30)
        message = ""
    except grpc.RpcError as e:
        message = e.details()
    if note:
        check(message and note[0].text == message,
              f"an unknown class: Score's message ({message!r}) is shown next to the class")

    # --- complete: the page's own PNG prompt, against Generate with that prompt ---
    upload("complete-pad", images[1], "complete.png")
    set_text("#complete-rows", "14")
    set_text("#complete-num", "2")
    set_text("#complete-seed", "5")
    el("#complete-run").click()
    wait(lambda: "pixels in" in el("#complete-status").text, "the completion finishes")
    req = native["GenerateRequest"](model="karm-fmnist", num_images=2, seed=5, prompt=raw(images[1]),
                                    prompt_rows=14)
    want, _, _ = native_images(req, 2)
    for i in range(2):
        got = canvas_pixels(el(f"#complete-images canvas[data-image='{i}']"))
        check(got == want[i] and got[:14 * 28] == images[1][:14 * 28],
              f"completion {i}: Generate's pixels for the same prompt rows and seed")
    shot("complete", "complete.png")

    # --- labels and phone width ---
    unlabelled = js("return [...document.querySelectorAll('input, select, button')]"
                    ".filter(e => e.offsetParent !== null && !(e.labels && e.labels.length) &&"
                    " !e.getAttribute('aria-label') && !e.textContent.trim()).map(e => e.id || e.outerHTML)")
    check(not unlabelled, f"every control has a label ({unlabelled})")
    # A phone's viewport (headless Chromium keeps its window at least 500 px wide).
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": 390, "height": 844, "deviceScaleFactor": 2, "mobile": True})
    width = js("return window.innerWidth")
    overflow = js("return document.documentElement.scrollWidth - window.innerWidth")
    check(width == 390, f"the viewport is a phone's, 390 px ({width})")
    check(overflow <= 0, f"at phone width (390 px) nothing runs off the page ({overflow} px)")
    if SHOTS:
        js("document.getElementById('generate').scrollIntoView()")
        driver.save_screenshot(os.path.join(SHOTS, "phone.png"))
    errors = [l for l in driver.get_log("browser") if l["level"] == "SEVERE"
              and "status of 4" not in l["message"]]  # the refusals the test asked for
    check(not errors, f"no script errors in the browser's console ({errors[:3]})")


def rest_error(hport, path, body):
    """A REST call's status and its JSON error message."""
    import json
    import urllib.error
    req = urllib.request.Request(f"http://127.0.0.1:{hport}{path}", data=body, method="POST",
                                 headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, ""
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()).get("error", "")


if __name__ == "__main__":
    sys.exit(main())
