{
  "format": "vlad.signature/2",
  "key_id": "b5ee11b70294dcc0",
  "algorithm": "ed25519",
  "signature": "cq6S8sCqreBcqEXXaxekM1HatKwCrs5wVEttYyeYltqTIt4DNgqc+EYFKFdoqsONLbSg03+4QCaPpNDzzjfpBw==",
  "signed_at": "2026-12-06T06:23:10Z",
  "manifest_sha256": "a7c4546acf87049181b3f963f3c6228fba3949f9ebb746ff211af257762c9df1"
}
