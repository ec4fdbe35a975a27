{
  "format": "vlad.signature/1",
  "key_id": "b5ee11b70294dcc0",
  "algorithm": "ed25519",
  "signature": "slnFugCIz8fXsDDs9oIrRAXv082YHY7U2v23OywRG6PI3D3VUg8vpM183/FHSTmb3VzLJ3cMNYXIPGqmR0nIBw==",
  "signed_at": "2026-12-02T11:25:23Z",
  "manifest_sha256": "3e947d3e81d2c4462e0df0171d9ebcf553d5d523ea963fd2c7d04e91ea9a120f"
}
