"""Named workloads to sweep the conductor on. Each is sized like Mooncake's synthetic trace
(3,000 requests, about a quarter of an hour) and loads the default simulated cluster
(LLaMA3-70B, 8 prefill + 8 decode A800 nodes) without saturating it at time scale 1;
each tunes its reuse to a target. Explicit flags override a preset's values."""

from __future__ import annotations

from dataclasses import dataclass

from loadgen.tracegen.params import GenParams


@dataclass(frozen=True)
class Preset:
    summary: str
    params: GenParams


PRESETS = {
    "conversation": Preset(
        "multi-turn chat: long first messages, short follow-ups, each turn resending the "
        "history (Mooncake's conversation trace)",
        GenParams(
            rate=3.34,
            input_mean=6000,
            input_sigma=1.2,
            turn_input_mean=400,
            output_mean=340,
            output_sigma=0.9,
            session_share=0.6,
            turns_mean=4,
            think_time=45,
            long_share=0.01,
            long_input=60000,
            target_reuse=0.40,
        ),
    ),
    "tool-agent": Preset(
        "agents: a few long shared tool definitions, short multi-step sessions whose tool "
        "results come back within seconds (Mooncake's tool&agent trace)",
        GenParams(
            rate=7.0,
            input_mean=2500,
            input_sigma=0.8,
            turn_input_mean=2500,
            output_mean=180,
            output_sigma=0.7,
            session_share=0.5,
            turns_mean=4,
            think_time=4,
            system_prompts=12,
            system_tokens=5000,
            system_sigma=0.4,
            system_zipf=1.1,
            target_reuse=0.70,
        ),
    ),
    "long-context": Preset(
        "document QA: long documents queried again and again, a few follow-up questions, "
        "rare one-off very long inputs",
        GenParams(
            rate=1.5,
            input_mean=300,
            input_sigma=0.8,
            turn_input_mean=150,
            output_mean=250,
            output_sigma=0.8,
            session_share=0.3,
            turns_mean=3,
            think_time=60,
            system_prompts=60,
            system_tokens=25000,
            system_sigma=0.6,
            system_zipf=0.9,
            system_share=0.9,
            long_share=0.05,
            long_input=90000,
            target_reuse=0.70,
        ),
    ),
    "no-reuse": Preset(
        "bursty single requests sharing nothing (BurstGPT, Azure LLM inference)",
        GenParams(
            rate=6.0,
            burstiness=0.25,
            input_mean=4500,
            input_sigma=1.1,
            output_mean=250,
            output_sigma=1.0,
        ),
    ),
    "mixed": Preset(
        "chat sessions and shared system prompts side by side, with long outliers",
        GenParams(
            rate=4.0,
            input_mean=3000,
            turn_input_mean=500,
            session_share=0.4,
            turns_mean=4,
            think_time=20,
            system_prompts=20,
            system_tokens=3000,
            system_share=0.5,
            long_share=0.02,
            long_input=80000,
            target_reuse=0.50,
        ),
    ),
}
