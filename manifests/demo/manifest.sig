{
  "format": "vlad.signature/2",
  "key_id": "b5ee11b70294dcc0",
  "algorithm": "ed25519",
  "signature": "mp9htxhZhsko7n96QtZLPL7knH+24s+hKWg9RINnKIABvhKvc6diEBZhBriHHmv7OVLtSQwkvhk0v89sIcxiCg==",
  "signed_at": "2026-12-06T12:43:33Z",
  "manifest_sha256": "beb6fae6847d6116d6c1f753bf4fa2d542548a370fa922691dae9297e40dcc27"
}
