{
  "format": "vlad.signature/2",
  "key_id": "b5ee11b70294dcc0",
  "algorithm": "ed25519",
  "signature": "ipFLEqWFzaIP0THixqgao+ervPwSGl33w2Ghjcrm9p7W+xdg1OT02uNtQ1pbFOn9Z5ztQG5C+vpAe9v7HlA6CA==",
  "signed_at": "2026-12-06T05:03:57Z",
  "manifest_sha256": "8d3ad6be070b6d90373e374c98d90355f542a3e83cc8f3086dcf319d7d514406"
}
