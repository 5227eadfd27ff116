"""siirl-envs' config sections (``siirl.config`` entry points): the environments by tag
(custom_envs), the agentic env manager and its schedulers, the multi-turn tool settings, the
embodied settings. Light modules: siiRL reads them to compose its schema, before anything
else of this package is imported."""
