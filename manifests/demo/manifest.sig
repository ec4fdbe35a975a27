{
  "format": "vlad.signature/2",
  "key_id": "b5ee11b70294dcc0",
  "algorithm": "ed25519",
  "signature": "49UZVEf/4zepW3nma0kHl5NC16rKrX6AJOq8L67ZjqDa6fB87OCMjjWikoQz76j7ga4ADZylSy5RZV06B2aJBQ==",
  "signed_at": "2026-12-04T09:14:03Z",
  "manifest_sha256": "11a39842f9fc1b419d2cc211cd88d06aea64408c535e90e964cb5d9affc3e673"
}
