# vLLM's OpenAI server image with omen's vLLM plugin installed (integrations/vllm), so that
# the deployment's OMEN_VLLM_URL makes vLLM push its KV block pool to the omen sidecar.
# Build from the repository root:
#   docker build -f deploy/vllm-omen.Dockerfile -t vllm-openai-omen .
# and set it as the vllm container's image (kustomize `images:` or the Deployment).
ARG VLLM_IMAGE=vllm/vllm-openai:latest
FROM ${VLLM_IMAGE}
COPY integrations/vllm /tmp/omen-vllm
# --no-deps: the plugin needs only the standard library; vLLM's own packages stay as they are.
RUN python3 -m pip install --no-cache-dir --no-deps /tmp/omen-vllm && rm -rf /tmp/omen-vllm
