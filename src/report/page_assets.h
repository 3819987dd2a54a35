// page_assets.h — the style sheet and the script every report page inlines.
#pragma once

extern const char REPORT_STYLE[];   // CSS
// JavaScript: draws each <canvas data-series="KEY KEY..."> as a line chart and each
// <canvas data-heatmap="KEY"> as a heatmap from the JSON {"series": {KEY: ...}} of
// <script id="report-data">, then sets <body data-drawn="N"> to the canvases drawn.
extern const char REPORT_SCRIPT[];
