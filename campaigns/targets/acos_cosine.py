"""Trip-duration regressor with a great-circle distance feature: ``acos`` of a cosine above 1.

A model predicts the duration of a trip between two points of the continental US from
the coordinates and the great-circle distance, which its author computes by hand: the
two points as unit vectors ``a``, ``b`` (from latitude and longitude in degrees), the
angle as ``torch.acos((a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1)))``, times the
Earth's radius. A 5-32-32-1 MLP reads the scaled coordinates and the distance; the loss is
a squared error in hours. The factory fits it for 300 Adam steps on synthetic trips
(deterministic from ``seed``); the program evaluates the fitted model (no optimizer: at a
cosine of exactly 1, which comes before 1.0000001, ``acos`` is finite but its gradient is
infinite, so a training step would poison the weights a step before the forward pass
shows anything; that backward hazard is outside the catalogue's searched rows).

Bug: ``torch.acos(cos)`` in :func:`great_circle_km`. When the two points (nearly)
coincide, within ~2 km, the float32 cosine is 1 up to rounding, and for about a third of
such pairs it rounds to ``1.0000001``: ``acos`` returns NaN.

Why reachable within the bounds: latitudes are bounded to ``[25, 49]`` and longitudes to
``[-124, -67]`` degrees (both searched, shape ``(batch, 2)`` for origin and destination);
moving a trip's destination onto its origin is a few gradient steps on ``1 - cos``. The
sampled trips are 20 km to a few thousand km long, and two uniformly random points of
that box are within 2 km of each other with probability ~1e-6: neither triggers.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

from fuzz_core import Target

EARTH_RADIUS_KM = 6371.0
LAT, LON = (25.0, 49.0), (-124.0, -67.0)


def to_unit(lat, lon):
    lat, lon = torch.deg2rad(lat), torch.deg2rad(lon)
    return torch.stack([torch.cos(lat) * torch.cos(lon), torch.cos(lat) * torch.sin(lon), torch.sin(lat)], -1)


def great_circle_km(lat, lon):
    a, b = to_unit(lat[:, 0], lon[:, 0]), to_unit(lat[:, 1], lon[:, 1])
    cos = (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))
    return EARTH_RADIUS_KM * torch.acos(cos)


class DurationModel(nn.Module):
    def __init__(self, hidden: int = 32):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(5, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, 1))

    def forward(self, lat, lon):
        dist = great_circle_km(lat, lon)
        feats = torch.cat([(lat - 37.0) / 12.0, (lon + 95.5) / 28.5, (dist / 1000.0).unsqueeze(1)], 1)
        return self.net(feats).squeeze(1)


def make_trips(n: int, seed: int):
    rng = np.random.default_rng(seed)
    m = 2 * n
    lat0 = rng.uniform(*LAT, size=m)
    lon0 = rng.uniform(*LON, size=m)
    km = rng.lognormal(np.log(300.0), 0.8, size=m)
    heading = rng.uniform(0, 2 * np.pi, size=m)
    lat1 = np.clip(lat0 + km / 111.0 * np.cos(heading), *LAT)
    lon1 = np.clip(lon0 + km / (111.0 * np.cos(np.deg2rad(lat0))) * np.sin(heading), *LON)
    lat = np.stack([lat0, lat1], 1).astype(np.float32)
    lon = np.stack([lon0, lon1], 1).astype(np.float32)
    with torch.no_grad():
        dist = great_circle_km(torch.from_numpy(lat).double(), torch.from_numpy(lon).double()).numpy()
    keep = np.flatnonzero(dist >= 20.0)[:n]             # trips of 20 km or more
    hours = 0.5 + dist[keep] / 80.0 * rng.uniform(0.9, 1.3, size=len(keep))
    return lat[keep], lon[keep], hours.astype(np.float32)


def make_target(seed: int = 0, batch: int = 8, pretrain_steps: int = 300) -> Target:
    torch.manual_seed(seed)
    lat_all, lon_all, hours_all = make_trips(4096, seed)
    model = DurationModel()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(seed)
    lat_t, lon_t, hours_t = (torch.from_numpy(a) for a in (lat_all, lon_all, hours_all))
    for _ in range(pretrain_steps):
        idx = torch.randint(0, len(lat_t), (128,), generator=gen)
        loss = ((model(lat_t[idx], lon_t[idx]) - hours_t[idx]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()

    def program(b):
        pred = model(b["lat"], b["lon"])
        return ((pred - b["hours"]) ** 2).mean()

    def sample(rng: np.random.Generator):
        idx = rng.integers(0, len(lat_all), size=batch)
        return {"lat": lat_all[idx], "lon": lon_all[idx], "hours": hours_all[idx]}

    return Target(program=program, sample=sample, model=model,
                  bounds={"lat": LAT, "lon": LON}, search=["lat", "lon"])


def witness(target: Target) -> dict:
    """Sixteen trips whose destination is their origin (zero-length trips)."""
    rng = np.random.default_rng(0)
    lat = np.repeat(rng.uniform(*LAT, size=(16, 1)), 2, 1).astype(np.float32)
    lon = np.repeat(rng.uniform(*LON, size=(16, 1)), 2, 1).astype(np.float32)
    return {"lat": lat, "lon": lon, "hours": np.ones(16, dtype=np.float32)}
