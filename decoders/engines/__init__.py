"""Serving engines as decoder backends: the same `GenerationRequest` in, `GenerationResult` out.

One module per protocol, sharing `client.EngineDecoder` (streaming, timing, stopping rules,
retries, concurrency, telemetry) and `server.EngineServer` (launch, health, stop):
- `llamacpp`: llama.cpp's native `/completion` (decoder `llama.cpp`);
- `openai_compat`: OpenAI `/v1/completions` (`openai`), with vLLM's extras (`vllm`), and
  `/v1/chat/completions` (`openai-chat`);
- `sglang`: SGLang's native `/generate` (`sglang`).
Nothing here imports `harness/`; the harness starts the servers and hands them in.
"""
