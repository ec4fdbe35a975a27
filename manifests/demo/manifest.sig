{
  "format": "vlad.signature/2",
  "key_id": "b5ee11b70294dcc0",
  "algorithm": "ed25519",
  "signature": "biu3EKSybJtwH6cbv1rU6Y2OcHaWNNtknk4jgVPdFvVLkXvGPo3KrpeKw4xg8Qg0Du1Jf9DXvL7V0kEw4XqVDQ==",
  "signed_at": "2026-12-03T05:56:10Z",
  "manifest_sha256": "c44cfcaf04de2473502031cf0dcab7569140438b4c6cfb8e535431c524d1660d"
}
