"""siirl-envs' config sections (``siirl.config`` entry points): the agentic env manager and
its schedulers, the embodied settings. Light modules: siiRL reads them to compose its
schema, before anything else of this package is imported."""
