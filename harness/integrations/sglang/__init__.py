"""The installed SGLang's MLA decode path on the harness's pool: import and stand-in (runtime, stand_in),
the request table (tables), the pool wrapping (wrappers) and the FlashInfer MLA backend (flashinfer_mla)."""
